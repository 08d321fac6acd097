"""What crash and fault runs share: the clients' workload, the ledger of what each was told,
and the verdict of the logs against it."""
