"""A bundle on a cluster: submit it, watch it, read its logs, cancel it — through the official ``kubernetes`` client
with the user's kubeconfig, as kubectl would, and nothing else of the cluster's.

The one stage that talks to a Kubernetes API server (the import contract keeps the client library here: ``build`` and
every other stage never import it). It reads a built bundle (the objects its kustomization lists) and what a run leaves
on the shared volume (through ``runs``' readers), and turns what the API server, Volcano's admission webhook and
Volcano's scheduler say into typed records; the cli prints them.

- :mod:`~recipekit.cluster.connect`: the kubeconfig, context and namespace; one line for each way a request fails
- :mod:`~recipekit.cluster.objects`: the bundle's objects, and a run named by its bundle or its Job
- :mod:`~recipekit.cluster.submit`: server-side dry run, what must exist first, then the run files and the Job
- :mod:`~recipekit.cluster.reasons`: why a Volcano PodGroup waits, from its conditions and events (pure)
- :mod:`~recipekit.cluster.status`: the Job, its PodGroup, its pods, and the run's progress from the volume
- :mod:`~recipekit.cluster.logs`: a pod's log, streamed, every line made safe for a terminal; and cancel
"""
