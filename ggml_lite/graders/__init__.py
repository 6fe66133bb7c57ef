"""graders: modules exported from the notebooks."""
