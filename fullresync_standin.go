package main

import "time"

// fullResyncDue stands in for the incremental-paging branch's rule, which
// replaces this file at merge: no job asks for a full resync here.
func fullResyncDue(pkg string, at time.Time, every time.Duration) bool { return false }
