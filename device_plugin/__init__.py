"""kubelet device plugin and node agent (vGPU, pGPU, MPS), metrics exporter, node labels."""
