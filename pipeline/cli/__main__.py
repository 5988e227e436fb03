"""`python -m pipeline.cli` is the `dspark-targets` command too."""

from pipeline.cli import main

if __name__ == "__main__":
    main()
