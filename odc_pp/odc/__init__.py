"""odc_pp.odc."""
