"""`python -m pipeline` is the `dspark-targets` command."""

from pipeline.cli import main

if __name__ == "__main__":
    main()
