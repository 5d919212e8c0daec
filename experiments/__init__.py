"""The comparison harness: run one job under several consistency modes and compare them."""
