"""The mount: its lifecycle (daemon), the parts wired together (assemble), the filesystem's
semantics with no FUSE types (fs) and the thin FUSE glue over them (fuse_ops)."""
