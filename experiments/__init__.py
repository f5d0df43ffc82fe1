"""Experiments: grids and sweeps of scenarios, their records, reports and plots."""
