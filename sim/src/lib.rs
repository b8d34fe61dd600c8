//! kvtwin-sim (thin until its issue lands).
