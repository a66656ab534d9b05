"""Durable files shared by the embedded backends (message log, offsets journal, schedule log).

- `framing`: the record frame `<u32 length><u32 crc32><payload>` and the one reader that
  decides where intact records end (a torn or corrupt tail stops it);
- `append_file`: the one writer of framed records: append, cut a torn tail, fsync, rename;
- `group_commit`: many writers, one fsync.
"""
