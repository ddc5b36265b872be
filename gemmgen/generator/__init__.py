"""Generator step of the pipeline: manifest → validated configs → rendered CUTLASS sources."""
