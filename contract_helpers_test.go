package main

import "time"

// rowsIn returns b's rows of message type M.
func rowsIn[M any, P contractMessage[M]](b *batchRows) []row[M] {
	for _, t := range b.tables {
		if r, ok := t.(*contractRows[M, P]); ok {
			return r.rows
		}
	}
	panic("no contract has this message type")
}

// batchWith is a batch holding rows and nothing else.
func batchWith[M any, P contractMessage[M]](rows []row[M]) *batchRows {
	b := decodeRecords(nil, 1<<20, time.Now())
	for _, t := range b.tables {
		if r, ok := t.(*contractRows[M, P]); ok {
			r.rows = rows
		}
	}
	return b
}
