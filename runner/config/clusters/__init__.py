"""Cluster templates rendered from a job spec: Slurm (sbatch) and Kubernetes (manifests)."""
