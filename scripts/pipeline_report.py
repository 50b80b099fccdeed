"""Write the report of a pipeline run (`instella_recipes.pipeline.report`):

python scripts/pipeline_report.py --run_dir runs/demo --expect eval/expected/tiny_demo.yaml
# -> runs/demo/report.md + PNG plots in runs/demo/report/; the run checked against a healthy run's ranges
"""

from instella_recipes.pipeline.report import main

if __name__ == "__main__":
    main()
