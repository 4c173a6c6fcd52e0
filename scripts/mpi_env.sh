# Sourced by the scripts: lets OpenMPI's mpirun run as root and place more ranks than cores, as
# on a small machine or in a container. Harmless for MPICH.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
