"""odc_pp.megatron."""
