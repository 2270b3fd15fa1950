/* The C side of uipoib's verbs bindings (build.rs runs bindgen on this file): the
 * system's libibverbs header, and the rdma_cm enums the removal watcher's tests check
 * its constants against (the watcher itself speaks the kernel ABI, not librdmacm). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
