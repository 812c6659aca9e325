"""The plan: the commands each node runs (launch.LaunchPlan), the step's memory and time (estimate, estimate_comm),
where outputs go (outputs) and the long-row path's memory (longcontext). Pure: no node is touched."""
