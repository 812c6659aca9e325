"""The advice: rules over (preset, facts) with their fixes (rules, core, cluster, moe, longcontext), the estimate's
figures with the advice as one report (report), and the data preview run on the master node (datapreview)."""
