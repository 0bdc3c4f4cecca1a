"""RunPod Instant Clusters (multi-node pods) from a laptop, through REST v2 `/v2/clusters` only.

    from podguard.pods.clusters.rest import cluster_api
    clusters = cluster_api(api)                          # over the REST client the pod commands use
    result = cluster_up(clusters, spec, ...)             # up.py: idempotent by name, waits for every node

A cluster is N identical GPU pods in one data centre. Its members are pods with `cluster {id, rank, ip}`,
managed through the cluster (the API may refuse an action on a member with 409: an expected answer).
Waiting costs one cluster GET per poll whatever the node count, plus one log stream per node.
Design notes: docs/pods.md ("Clusters").
"""
