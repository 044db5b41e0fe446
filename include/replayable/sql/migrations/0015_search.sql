-- Search finds chunks by their vectors first, then the documents that hold them (ADR 0119):
-- through this index, not by reading every document's chunks.
CREATE INDEX IF NOT EXISTS doc_chunks_chunk_idx ON replayable.doc_chunks (chunk_id);
-- Whether a model has vectors at all: asked before a search pays for a question's vector.
CREATE INDEX IF NOT EXISTS embeddings_model_idx ON replayable.embeddings (model, dim);
