"""The parameter server: message loop, dense blocks, sparse tables, optimizers."""
