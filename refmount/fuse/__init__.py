"""The FUSE filesystem: the mount's lifecycle (daemon), the parts wired together (assemble), the
filesystem's semantics with no FUSE types (fs) and the thin FUSE glue over them (fuse_ops).

(Not named `mount`: a package of that name would replace the function `refmount.mount` as soon as
one of its modules is imported.)"""
