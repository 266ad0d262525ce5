"""Rolling a vLLM image across the fleet: the plan, the per-host state machine and the ledger."""
