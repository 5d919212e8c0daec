"""The worker side: the training loop, the DDP baseline worker, fault injection and jobs."""
