-- The status of one dead letter, to tell "no such letter" from "no longer open".
SELECT status FROM replayable.dead_letters WHERE id = %(id)s
