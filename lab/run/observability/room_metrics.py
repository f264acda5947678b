"""What a workshop room pushes to its Pushgateway, under job lab-room: each seat's lessons' checks and exercises'
gradings, each lesson's check count and each seat's GPUs. The room's dashboard (monitoring/grafana/dashboards/
room.json) reads them; lab.run.observability.metrics pushes (one warning line when the gateway is unreachable).
"""

from __future__ import annotations

import time

from lab.run.cluster import seat
from lab.run.observability.metrics import ROOM_JOB, Sample, push


def push_lesson_checks(gateway: str, lesson: str, passed: int, failed: int) -> bool:
    """A lesson's "what you should see" checks so far, under (job lab-room, seat, lesson: its number, "01"),
    replacing the lesson's last push: the instructor's room dashboard shows seats by lessons from these."""
    values: list[Sample] = [
        ("lab_lesson_checks_passed", "Checks of the lesson's last run that held", {}, passed),
        ("lab_lesson_checks_failed", "Checks (or commands) of the lesson's last run that failed", {}, failed),
        ("lab_lesson_last_check_timestamp_seconds", "Unix time of the lesson's last check", {}, time.time()),
    ]
    return push(gateway, ROOM_JOB, {"seat": seat.seat() or "none", "lesson": lesson}, values, "the lesson's checks")


def push_exercise(gateway: str, exercise: str, passed: int, failed: int, first_failed: str | None = None) -> bool:
    """An exercise's last check under (job lab-room, seat, exercise), replacing its last push: the room's dashboard
    shows each seat's exercises as held (no check failed), failed (and the first check that did), or not run
    (no series). The records behind them: lab.course.records."""
    values: list[Sample] = [
        ("lab_exercise_checks_passed", "Checks of the exercise's last grading that held", {}, passed),
        ("lab_exercise_checks_failed", "Checks of the exercise's last grading that failed", {}, failed),
        ("lab_exercise_last_check_timestamp_seconds", "Unix time of the exercise's last grading", {}, time.time()),
    ]
    if first_failed:
        values.append(
            ("lab_exercise_failing_check_info", "The first check that failed, by name", {"check": first_failed}, 1)
        )
    grouping = {"seat": seat.seat() or "none", "exercise": exercise}
    return push(gateway, ROOM_JOB, grouping, values, "the exercise's checks")


def push_room_lessons(gateway: str, lessons: list[tuple[str, int]]) -> bool:
    """How many checks each lesson (its number, "01") makes, one group per lesson: a seat's lesson has passed when
    lab_lesson_checks_passed reaches lab_lesson_checks_expected."""
    return all(
        push(
            gateway,
            ROOM_JOB,
            {"lesson": number},
            [("lab_lesson_checks_expected", "The lesson's checks, all of which hold when it passes", {}, count)],
            f"lesson {number}'s check count",
        )
        for number, count in lessons
    )


def push_room_seats(gateway: str, seats: list[tuple[str, list[str]]]) -> bool:
    """Which GPUs each seat of a room holds (seat, [gpu index, ...]), one group per seat: a dashboard joins the
    GPUs' own series (dcgm-exporter's, labelled by `gpu`) to seats through lab_room_seat_gpu_info."""
    done = True
    for name, gpus in seats:
        values: list[Sample] = [
            ("lab_room_seat_gpu_info", "A GPU of the seat (1 per GPU it holds)", {"gpu": gpu}, 1) for gpu in gpus
        ]
        values.append(("lab_room_seat_gpus", "GPUs the seat holds", {}, len(gpus)))
        done &= push(gateway, ROOM_JOB, {"seat": name}, values, f"seat {name}'s GPUs")
    return done
