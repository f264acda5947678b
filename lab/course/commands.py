"""The course wing's commands, one row each: workshop, report, pitfall, exercise (list, start, check) and room
(plan, serve, status, reset, prepare-seat). Arguments: lab.course.arguments, lab.course.exercises.arguments,
lab.course.room.arguments; each handler imports what it runs when it is called. lab.cli joins this table with the
other wings'.
"""

from __future__ import annotations

import argparse

from lab.command import Command
from lab.course import arguments
from lab.course.exercises import arguments as exercise_arguments
from lab.course.room import arguments as room_arguments
from lab.errors import EXIT_OK


def workshop(args: argparse.Namespace) -> int:
    from lab.course.teaching import workshop as lessons

    return lessons.run(
        args.config or lessons.default_config(), args.overrides, args.nproc_per_node, args.output_dir, args.only
    )


def report(args: argparse.Namespace) -> int:
    from lab.course.teaching import report as reports

    print(f"report: {reports.build(args.paths, args.out)}")
    return EXIT_OK


def pitfall(args: argparse.Namespace) -> int:
    from lab.course.pitfalls import command

    return command.run(args)


def exercise_list(args: argparse.Namespace) -> int:
    from lab.course.exercises import command

    return command.listing(args)


def exercise_start(args: argparse.Namespace) -> int:
    from lab.course.exercises import command

    return command.start_command(args)


def exercise_check(args: argparse.Namespace) -> int:
    from lab.course.exercises import command

    return command.check(args)


def room_plan(args: argparse.Namespace) -> int:
    from lab.course.room import plan_table

    return plan_table.run(args)


def room_serve(args: argparse.Namespace) -> int:
    from lab.course.room import serve

    return serve.run(args)


def room_status(args: argparse.Namespace) -> int:
    from lab.course.room import status

    return status.run(args)


def room_reset(args: argparse.Namespace) -> int:
    from lab.course.room import seats

    return seats.reset(args)


def room_prepare_seat(args: argparse.Namespace) -> int:
    from lab.course.room import seats

    return seats.prepare(args)


def _exercise_actions() -> tuple[Command, ...]:
    return (
        Command("list", "the exercises: lesson, minutes, what you write", exercise_arguments.list_args, exercise_list),
        Command(
            "start",
            "copy an exercise's starter into your folder (never over your work)",
            exercise_arguments.start_args,
            exercise_start,
        ),
        Command(
            "check",
            "run your file under torchrun, watched, and print the checklist: exit 0 all hold, 1 one fails",
            exercise_arguments.check_args,
            exercise_check,
        ),
    )


def _room_actions() -> tuple[Command, ...]:
    return (
        Command(
            "plan",
            "seats with disjoint GPUs, cores and memory: the table to check before the room arrives",
            room_arguments.plan_args,
            room_plan,
        ),
        Command(
            "serve",
            "JupyterHub serving the room's seats, in the foreground (make room)",
            room_arguments.serve_args,
            room_serve,
        ),
        Command(
            "status",
            "every seat by lesson: passed, failed, running, not run; its newest run and memory",
            room_arguments.status_args,
            room_status,
        ),
        Command(
            "reset", "a seat afresh: its copy of the lessons and its runs deleted", room_arguments.seat_args, room_reset
        ),
        Command(
            "prepare-seat",
            "copy the lessons into a seat's folder where missing (a seat container's start)",
            room_arguments.prepare_seat_args,
            room_prepare_seat,
        ),
    )


COMMANDS: tuple[Command, ...] = (
    Command(
        "workshop", "baseline, then DDP with the same global batch, then compare", arguments.workshop_args, workshop
    ),
    Command("report", "report.md with plots from run directories and benchmark results", arguments.report_args, report),
    Command("pitfall", "the course's pitfalls: the mistake, then the fix, measured", arguments.pitfall_args, pitfall),
    Command(
        "exercise",
        "hands-on: you write the distributed code, the lab runs it on several ranks and measures what it did",
        actions=_exercise_actions,
        metavar="ACTION",
    ),
    Command(
        "room",
        "a workshop room: JupyterHub with a seat per learner, each with its own GPUs",
        actions=_room_actions,
        metavar="ACTION",
    ),
)
