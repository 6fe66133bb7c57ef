"""models: modules exported from the notebooks."""
