"""Entry points: each a thin `main` over the library; also installed as `instella-*` console scripts."""
