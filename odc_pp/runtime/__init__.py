"""odc_pp.runtime."""
