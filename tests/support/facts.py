"""Cluster facts that stand for two H200 nodes on a slow measured link (the wizard's advice reads them)."""

from qwen_tui.cluster.facts import GPU, ClusterFacts, LinkFacts, NodeFacts


def slow_h200_facts(gbps: float = 2.0) -> ClusterFacts:
    h200 = [GPU(index=0, name="NVIDIA H200", memory_total_mib=143771)]
    return ClusterFacts(nodes={0: NodeFacts(hostname="node0", gpus=h200, route_interface="eth0",
                                            addresses={"eth0": ["10.0.0.1"]}),
                               1: NodeFacts(hostname="node1", gpus=h200, route_interface="eth0",
                                            addresses={"eth0": ["10.0.0.2"]})},
                        links={1: LinkFacts(port_reachable=True, bandwidth_gbps=gbps)}, master_port_free=True)
