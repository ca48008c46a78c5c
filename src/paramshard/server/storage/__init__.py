"""What a server stores: row stores (numpy, compiled, tiered), tables, dense blocks, kernels."""
