"""The wizard's model: the preset being edited, the nodes' facts, the connections and each step's colour
(state). The faces draw it; it imports no face."""
