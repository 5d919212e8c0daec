"""The server side: partition plan, shard, optimizers, consistency controllers, service loop."""
