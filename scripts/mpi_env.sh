# Sourced by the scripts: lets OpenMPI's mpirun run as root and place more ranks than cores, as
# on a small machine or in a container. Harmless for MPICH.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# A host that stops answering (a cut link, a dead machine) must end the job, not leave mpirun
# waiting: Open MPI's daemons probe each other's idle connections after 10 s, every 5 s, and give
# a daemon up after 3 missed probes (its default: 300 s, 20 s, 9 probes, i.e. 8 minutes, and
# after an MPI_Abort mpirun waited on the lost daemon for good). docs/runtime.md "Rank main and
# failures".
export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-10}
export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-5}
export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}
