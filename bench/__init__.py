"""jobrun's benchmark (issue 6): ``make bench`` or ``python -m bench``; see bench/README.md."""
