"""viz: modules exported from the notebooks."""
