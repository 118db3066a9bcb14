"""Engine: requests, slots, scheduler, runner, sampler."""
