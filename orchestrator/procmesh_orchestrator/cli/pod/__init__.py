"""`procmesh pod`: render the Kubernetes manifests, and run their pod as local processes.

One module per role, in the order a `procmesh pod run` goes through them:

- `manifests`: the objects, rendered by ``kubectl kustomize`` (or read from a rendered YAML file);
- `sources` and `plan`: the Deployment as local processes, with the same command, args and
  environment; Secrets and ConfigMaps materialised in a temporary directory, each volume a
  directory there, mount paths, ``0.0.0.0`` and (with ``free_ports``) ports rewritten;
- `runner`: the processes started, probed and stopped in the kubelet's order;
- `command`: the two subcommands, ``procmesh pod render`` and ``procmesh pod run``.

Nothing at run time imports this package: it is a developer's tool next to ``kubectl apply -k``.
"""
