"""The course wing: the lessons, the learner's exercises, the pitfalls and the workshop room.

Its commands (lab.course.commands): workshop, report, pitfall, exercise ..., room .... It imports the measure and
run wings and the ground.
"""
