"""The advice: rules over (preset, facts) with their fixes (rules, core, cluster, moe, longcontext), the estimate's
figures with the advice as one report (report), and the data preview's report of the counts the master makes
(datapreview). Nothing here talks to a node (pyproject.toml's advice-no-node-io contract)."""
