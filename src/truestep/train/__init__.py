"""The step (forward/backward/clip/optimizer/schedule) and the short loop that calls the hooks."""
