"""One kernel or layer at the models' shapes."""
