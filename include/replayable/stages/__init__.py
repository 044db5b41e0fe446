"""Stage functions: plain, typed, and free of Airflow imports so that they test by calling."""
