"""`python -m instella_recipes.sandbox`: start a pool, run one trivial program, print `sandbox ok` (or fail)."""

from .pool import main

main()
