"""Inside a cluster node: the cluster gate before any worker starts, and the workers' socket interface.

Why and how: docs/clusters-in-node.md.
"""
