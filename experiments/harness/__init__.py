"""The comparison harness: `psrv experiment SPEC` runs one job under every variant of a spec through the launcher,
then collects the runs, plots them, writes the report and the tables, and tracks them (TensorBoard, MLflow);
the remedies' quality grids read its runs."""
