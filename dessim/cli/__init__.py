"""Command-line interface (top layer): parses arguments, calls the public API, prints results."""
