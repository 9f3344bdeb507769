"""What each key's file contains: the raw view (referenced bytes verbatim) and the decoded view
(chunks decoded, metadata rewritten so that netCDF-C and every other reader read it right)."""
