"""Reading results back: summary tables, repeat statistics and figures."""
