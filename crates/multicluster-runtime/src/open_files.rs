//! The process's limit on open files, which a fleet needs raised.

/// Raises this process's soft limit on open files to its hard limit, and
/// returns both soft limits: before and after. A fleet holds a connection
/// (a file descriptor) per cluster at least, and the usual default soft
/// limit, 1,024, is far below what the hard limit allows.
pub(crate) fn raise_open_files_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return Ok((limit.current, limit.current));
    }
    setrlimit(
        Resource::Nofile,
        rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )?;
    Ok((limit.current, getrlimit(Resource::Nofile).current))
}
