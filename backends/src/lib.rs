//! kvtwin-backends (thin until its issue lands).
