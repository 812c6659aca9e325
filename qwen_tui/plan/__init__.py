"""The plan: the commands each node runs (launch.LaunchPlan), the step's memory (estimate), time and scaling
(estimate_time, estimate_comm), where outputs go (outputs) and the long-row path's memory (longcontext). Pure: no
node is touched."""
