SELECT data FROM replayable.artifacts WHERE stage = %(stage)s AND artifact_key = %(key)s
