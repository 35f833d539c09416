"""Plate creation: synthetic generation, import from CellProfiler tables, layout conversion, realism checks."""
