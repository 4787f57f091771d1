"""State capture/restore (all of it, per rank), the commit protocol, the one resume resolver, verify,
retention. Decides nothing about *when* to save: that is the hook's policy."""
