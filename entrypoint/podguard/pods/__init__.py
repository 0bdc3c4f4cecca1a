"""The RunPod side of podguard: pod specs, the API clients, readiness, the heal ladder and in-pod self-heal.

    from podguard.pods.api import open_api
    api = open_api("rest")
    pods = api.list_pods()

REST v2 (stdlib HTTP, part of the core install) is the default; GraphQL through the `runpod` SDK
(`podguard[pods]`) is used for spot pods and `--api graphql`. Only `pods/graphql_api.py` imports `runpod`.
Design notes: docs/pods.md.
"""
